"""Policies that ship with the framework (the balloons policy lives in ``nri_balloons``)."""
