"""WSGI entry point of the embedded default (``manage.py serve``): the portal with its static
files served by Django's static-files handler, as the development server serves them, since no
proxy stands in front (compose's nginx serves them there, and ``portal.wsgi`` is its entry)."""

import os

from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = StaticFilesHandler(get_wsgi_application())
