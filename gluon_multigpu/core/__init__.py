"""The section itself: devices, the networks and their recipes, the data, the kvstores, the loop."""
