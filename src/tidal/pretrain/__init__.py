"""tidal.pretrain"""
