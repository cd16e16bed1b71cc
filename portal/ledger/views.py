"""Ledger pages and the transparency-log API: checkpoint, leaves, inclusion and consistency proofs.

Readable by any signed-in member of an institution (``ledger.view``): leaves hold ids and figures
only. The JSON endpoints answer 400 with ``{"error": …}`` for bad parameters and 404 for a leaf or
checkpoint that does not exist; every hash is base64 of 32 bytes, as in the checkpoint note. A
verifier recomputes the root from ``leaf_hash`` and ``proof`` (RFC 9162 §2.1.3.2 / §2.1.4.2) and
checks it against the root line of the returned checkpoint, whose signature it checks with the
platform's verifier key shown on the ledger page.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.choice_fields import ModelChoiceField
from portal.ledger import selectors, services
from portal.ledger.models import LedgerCheckpoint, LedgerEntry
from portal.ledger.signer import ledger_verifier_key
from portal.selectors import administered_institutions

PAGE_SIZE = 50


class WitnessKeyForm(forms.Form):
    institution = ModelChoiceField(queryset=None, empty_label=None)
    verifier_key = forms.CharField(
        max_length=400,
        label="Verifier key",
        help_text="A note verifier key: name+keyID+base64 (e.g. from Go's note.GenerateKey).",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["institution"].queryset = administered_institutions(user=user)


class CosignForm(forms.Form):
    note = forms.CharField(
        widget=forms.Textarea,
        label="Cosigned checkpoint",
        help_text="The latest checkpoint note with your witness's signature line appended.",
    )


def _require_viewer(request) -> None:
    if not selectors.ledger_visible(user=request.user):
        raise PermissionDenied("The ledger is open to members of an institution.")


class _Leaves:
    """The leaves for the paginator, counted as ``max(index) + 1`` (dense) instead of COUNT(*)."""

    def __init__(self, queryset, size: int) -> None:
        self.queryset, self.size = queryset, size

    def count(self) -> int:
        return self.size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        return self.queryset[key]


def _page_context(request, *, witness_form=None, cosign_form=None) -> dict:
    checkpoint = selectors.ledger_checkpoint()
    size = selectors.ledger_size()
    leaves = _Leaves(selectors.ledger_entries(), size)
    entries = Paginator(leaves, PAGE_SIZE).get_page(request.GET.get("page"))
    witnesses = selectors.ledger_witnesses_of(user=request.user)
    can_witness = administered_institutions(user=request.user).exists()
    return {
        "checkpoint": checkpoint,
        "checkpoint_note": selectors.ledger_checkpoint_note(checkpoint) if checkpoint else "",
        "cosigners": selectors.ledger_cosigners(checkpoint) if checkpoint else [],
        "verifier_key": ledger_verifier_key(),
        "size": size,
        "uncovered": size - checkpoint.size if checkpoint else size,
        "witnessing": selectors.ledger_witnessing(),
        "page_obj": entries,
        "witnesses": witnesses,
        "can_witness": can_witness,
        "witness_form": witness_form
        or (WitnessKeyForm(user=request.user) if can_witness else None),
        "cosign_form": cosign_form or CosignForm(),
    }


@login_required
@require_GET
def ledger_page(request):
    """The ledger: latest checkpoint, the platform's verifier key, leaves newest first."""
    _require_viewer(request)
    return render(request, "portal/ledger/ledger.html", _page_context(request))


@login_required
@require_POST
def ledger_witness_add(request):
    """An institution admin registers a witness verifier key."""
    _require_viewer(request)
    form = WitnessKeyForm(request.POST, user=request.user)
    if form.is_valid():
        try:
            services.ledger_witness_add(
                by=request.user,
                institution=form.cleaned_data["institution"],
                verifier_key=form.cleaned_data["verifier_key"],
            )
        except PermissionError as exc:
            raise PermissionDenied(str(exc)) from exc
        except services.LedgerError as exc:
            form.add_error("verifier_key", str(exc))
        else:
            messages.success(request, "Witness key registered.")
            return redirect("portal:ledger")
    context = _page_context(request, witness_form=form)
    return render(request, "portal/ledger/ledger.html", context, status=400)


@login_required
@require_POST
def ledger_cosign(request, size: int):
    """A witness's admin submits a cosigned copy of checkpoint ``size``."""
    _require_viewer(request)
    checkpoint = get_object_or_404(LedgerCheckpoint, size=size)
    form = CosignForm(request.POST)
    if form.is_valid():
        try:
            services.ledger_checkpoint_cosign(
                by=request.user, checkpoint=checkpoint, note=form.cleaned_data["note"]
            )
        except services.LedgerError as exc:
            form.add_error("note", str(exc))
        else:
            messages.success(request, f"Cosignature of checkpoint {size} accepted.")
            return redirect("portal:ledger")
    context = _page_context(request, cosign_form=form)
    return render(request, "portal/ledger/ledger.html", context, status=400)


@login_required
@require_GET
def ledger_checkpoint(request):
    """The latest (or ``?size=``) checkpoint as a text/plain signed note, with cosignatures."""
    _require_viewer(request)
    size = request.GET.get("size")
    if size is not None and not size.isdigit():
        return HttpResponse("size must be a whole number\n", status=400, content_type="text/plain")
    checkpoint = selectors.ledger_checkpoint(size=int(size) if size else None)
    if checkpoint is None:
        return HttpResponse("no checkpoint\n", status=404, content_type="text/plain")
    note = selectors.ledger_checkpoint_note(checkpoint)
    return HttpResponse(note, content_type="text/plain; charset=utf-8")


def _json(call, **kwargs) -> JsonResponse:
    try:
        return JsonResponse(call(**kwargs))
    except services.LedgerIntegrityError as exc:
        return JsonResponse({"error": str(exc)}, status=500)
    except services.LedgerError as exc:
        return JsonResponse({"error": str(exc)}, status=400)


@login_required
@require_GET
def ledger_leaf(request, index: int):
    """Leaf ``index``: its exact data, the parsed record and its leaf hash (JSON)."""
    _require_viewer(request)
    try:
        return _json(selectors.ledger_leaf, index=index)
    except LedgerEntry.DoesNotExist:
        return JsonResponse({"error": f"no leaf {index}"}, status=404)


@login_required
@require_GET
def ledger_inclusion(request):
    """Inclusion proof ``?index=&size=`` (size defaults to the latest checkpoint's)."""
    _require_viewer(request)
    return _json(
        selectors.ledger_inclusion, index=request.GET.get("index"), size=request.GET.get("size")
    )


@login_required
@require_GET
def ledger_consistency(request):
    """Consistency proof ``?first=&second=`` (second defaults to the latest checkpoint's)."""
    _require_viewer(request)
    return _json(
        selectors.ledger_consistency,
        first=request.GET.get("first"),
        second=request.GET.get("second"),
    )
