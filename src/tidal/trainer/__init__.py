"""tidal.trainer"""
