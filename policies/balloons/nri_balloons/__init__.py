"""nri_balloons: the balloons policy (not yet implemented)."""
