"""tidal.tasks"""
