"""tidal.sandbox"""
