"""tidal.orchestrator"""
