"""nri_sst: the privileged Intel SST helper sidecar and its client (not yet implemented)."""
