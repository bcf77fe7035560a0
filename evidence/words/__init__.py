"""How the dashboard says things in the reader's language: times, protocol words, finding details,
audit actions, decision reasons, the doubt panel. Used by pages and templates; records keep their own words."""
