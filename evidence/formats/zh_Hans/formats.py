# The shown time of evidence.words.i18n.shown_time; " UTC" follows it.
DATETIME_FORMAT = "Y年n月j日 H:i:s"
THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3
