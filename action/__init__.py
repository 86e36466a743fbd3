"""Entry code of the forgekit GitHub Action (``action.yml``): see :mod:`action.main`."""
