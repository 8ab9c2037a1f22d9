"""Release side: the version manifest, SHA256SUMS (publishing and fetch: issue 6)."""
