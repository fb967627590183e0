"""On-device runner, deployment, profiling campaigns, profile store and the CLI."""
