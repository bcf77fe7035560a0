# The shown time of evidence.i18n.shown_time; " UTC" follows it.
DATETIME_FORMAT = "Y-m-d H:i:s"
