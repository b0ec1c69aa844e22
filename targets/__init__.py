"""Shipped board profiles (YAML package data); see README.md here and edgesdk.profile."""
