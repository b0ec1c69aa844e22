"""Recipe presets (YAML), validated by edgesdk.build.recipes."""
