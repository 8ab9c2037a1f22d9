"""inspect_ai integration (optional extra `[inspect]`).

- `modal_env.ModalSandboxEnvironment`: a `modal` sandbox environment, registered with
  inspect_ai through the package's `inspect_ai` entry point.
- `adapter.InspectSandbox`: any inspect_ai sandbox environment as our provider, so a
  solver can inject the runtime into docker/k8s/local sandboxes and use our clients.
"""
