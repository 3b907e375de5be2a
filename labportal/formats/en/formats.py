"""English date formats for a lab whose members come from everywhere: unambiguous and on a
24-hour clock (2 Dec 2026, 2026-12-02 14:00), never Django's US style (12/02/2026 2 p.m.,
which half the world reads as the 12th of February). Chinese: ../zh_Hans."""

DATE_FORMAT = "j M Y"
DATETIME_FORMAT = "j M Y, H:i"
TIME_FORMAT = "H:i"
YEAR_MONTH_FORMAT = "F Y"
MONTH_DAY_FORMAT = "j F"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
