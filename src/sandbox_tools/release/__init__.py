"""A release as its users get it: the version manifest and SHA256SUMS, fetching verified
artifacts (mirrors, directories, bundles), and the manifest published with the package.
Publishing it is the maintainer's side, `sandbox_tools.publishing`."""
