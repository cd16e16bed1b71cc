"""Boundary to django-allauth: who may sign up (SSO adapters arrive with institutional sign-in)."""

from allauth.account.adapter import DefaultAccountAdapter
from django.conf import settings


class AccountAdapter(DefaultAccountAdapter):
    """Accounts are onboarded by institutions; open self-sign-up only when ``FRP_OPEN_SIGNUP``."""

    def is_open_for_signup(self, request) -> bool:
        return settings.FRP_OPEN_SIGNUP
