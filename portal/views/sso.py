"""Sign-in: pick your institution (list, search, or by e-mail domain) or use a portal account."""

from __future__ import annotations

from allauth.account.views import LoginView
from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal import selectors
from portal.forms import SSODiscoverForm


class PortalLoginView(LoginView):
    """allauth's login view with the institutions' single sign-on choices beside it."""

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        q = self.request.GET.get("q", "").strip()
        context["sso_q"] = q
        context["sso_choices"] = selectors.sso_choices(q=q)
        context["discover_form"] = SSODiscoverForm()
        return context


login = PortalLoginView.as_view()


@require_POST
def sso_discover(request):
    """Find the institution by the e-mail's domain and offer its sign-in (a POST, so CSRF-safe)."""
    form = SSODiscoverForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Enter a valid e-mail address.")
        return redirect("account_login")
    idp = selectors.idp_for_email(form.cleaned_data["email"])
    if idp is None:
        domain = form.cleaned_data["email"].rpartition("@")[2]
        messages.error(
            request,
            f"No institution on the portal signs in users from {domain}. "
            "Pick your institution from the list, or use a portal account.",
        )
        return redirect("account_login")
    return render(request, "account/sso_continue.html", {"idp": idp})
