"""Fleet commands: deploy, devices, broker."""
