"""The device's update path: download, verify, stage, activate, health-check, commit or roll back."""
