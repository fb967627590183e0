"""Fleet files, transports (local / SSH / ADB), device facts and the emulated fleet."""
