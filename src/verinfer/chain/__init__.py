"""Python side of the verinfer contracts: artifacts, deployment, typed bindings, event readers,
a local anvil helper and the `verinfer chain` CLI. See docs/contracts.md."""
