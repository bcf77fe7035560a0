# The shown time of evidence.words.i18n.shown_time; " UTC" follows it.
DATETIME_FORMAT = "Y-m-d H:i:s"
