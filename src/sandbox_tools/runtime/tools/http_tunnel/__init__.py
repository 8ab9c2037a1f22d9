"""HTTP tunnel: requests made inside the sandbox, answered by the host (model proxy)."""
