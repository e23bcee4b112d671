"""tidal.telemetry"""
