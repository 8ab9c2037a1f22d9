"""The maintainer's side of a release: `tools release` (publish to S3 and GitHub, with the
validation coverage it requires) and `tools wheel`. A release as users get it (the
manifest, fetch, bundles) is `sandbox_tools.release`, below the injector; this package
sits above the matrix, so the two never form a cycle."""
