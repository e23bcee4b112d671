"""tidal.bench"""
