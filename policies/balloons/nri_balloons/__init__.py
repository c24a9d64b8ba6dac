"""nri_balloons: the balloons policy (entry point ``balloons = nri_balloons.plugin:plugin``)."""
