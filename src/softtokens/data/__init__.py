"""Rows the method trains and is tested on: the hub sources (or local copies) and how each is
normalised, the seeded splits, the prompt template, and the toy's synthetic arithmetic."""
