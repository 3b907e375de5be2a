"""Chinese date formats where Django's differ from how the lab writes them (GLOSSARY.md):
the weekday follows the date, 2026年12月2日 星期三 14:00. Everything else is Django's."""

DATETIME_FORMAT = "Y年n月j日 l H:i"
