"""The fronts: each speaks one wire protocol to the same engine and imports no other front."""
