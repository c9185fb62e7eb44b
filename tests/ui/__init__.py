"""The dashboard (specui/ui/, app.py): the running app, rendering, memory, load, the Space."""
