from __future__ import annotations

from django.contrib import admin

from handbook.models import RuleSuggestion


@admin.register(RuleSuggestion)
class RuleSuggestionAdmin(admin.ModelAdmin[RuleSuggestion]):
    list_display = ("topic", "author", "state", "created_at")
    list_filter = ("state",)
    search_fields = ("topic", "text", "author__username")
    readonly_fields = ("author", "topic", "text", "created_at")
    fields = ("author", "topic", "text", "created_at", "state", "staff_answer")

    def has_add_permission(self, request: object) -> bool:
        return False
