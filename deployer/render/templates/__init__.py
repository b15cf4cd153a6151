"""Launch script templates (shipped as the package data `deployer.render.templates`)."""
