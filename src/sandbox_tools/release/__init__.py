"""Release side: the version manifest and SHA256SUMS, publishing (S3, GitHub releases),
fetching verified artifacts (mirrors, directories, bundles) and the wheel with bundled
artifacts."""
