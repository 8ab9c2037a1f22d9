"""tools validate: every artifact across distributions, architectures and scenarios."""
