"""Training of the embedded default models, their draft, EAGLE-3 heads and repository adaptation."""
