"""Inputs loaded strictly: recipes, sites, platforms, user defaults; errors name the key."""
