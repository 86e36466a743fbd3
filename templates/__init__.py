"""jinja2 templates of artifact metadata; installed as the package ``forgekit.templates``."""
