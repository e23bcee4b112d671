"""tidal.engine"""
