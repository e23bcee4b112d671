"""Named recipes: `tidal train smollm2` reads smollm2.toml here (tidal.config.loader)."""
