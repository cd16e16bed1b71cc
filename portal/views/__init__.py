"""Views of the portal core, one module per area (dashboard, sign-in, institution admin, projects)."""
