"""Pages of a compute pool for its institution's admins: settings and calendars (edit), the
adapter's reading (and a read on demand), carbon CSV upload, the queue with each job's reason, and the calendar plot (availability, price,
carbon intensity and the planned jobs over the coming days)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from federation import carbon, pool_selectors, pool_services
from federation.models import ComputePool
from federation.pool_forms import (
    CarbonCsvForm,
    ComputePoolForm,
    ExceptionFormSet,
    PoolCreateForm,
    PriceBandFormSet,
    WindowFormSet,
)
from portal.models import Site
from portal.permissions import can


def _pool_or_404(request, pk: int) -> ComputePool:
    pool = get_object_or_404(ComputePool.objects.select_related("site__institution"), pk=pk)
    if not can(request.user, "pool.manage", pool):
        raise Http404("No such pool")
    return pool


def _context(pool, **extra):
    return {"pool": pool, "institution": pool.institution, "tab": "sites", **extra}


@login_required
def pool_create(request, site_pk: int):
    """Add a pool to a site (its institution's admins): name, resources, price, power; then the
    pool's settings page for its calendars."""
    site = get_object_or_404(Site.objects.select_related("institution"), pk=site_pk)
    if not can(request.user, "institution.admin", site.institution):
        raise Http404("No such site")
    data = request.POST if request.method == "POST" else None
    form = PoolCreateForm(data, site=site)
    if data is not None and form.is_valid():
        pool = pool_services.pool_create(by=request.user, site=site, form=form)
        messages.success(request, f"Pool {pool.name} added to {site.name}.")
        return redirect("federation:pool_edit", pk=pool.pk)
    return render(
        request,
        "federation/pool_create.html",
        {"site": site, "institution": site.institution, "tab": "sites", "form": form},
    )


@login_required
def pool_edit(request, pk: int):
    """Resources, lending calendar, prices, carbon source and power draw of one pool."""
    pool = _pool_or_404(request, pk)
    data = request.POST if request.method == "POST" else None
    form = ComputePoolForm(data, instance=pool)
    formsets = [
        WindowFormSet(data, instance=pool, prefix="windows"),
        PriceBandFormSet(data, instance=pool, prefix="bands"),
        ExceptionFormSet(data, instance=pool, prefix="exceptions"),
    ]
    if data is not None and form.is_valid() and all(fs.is_valid() for fs in formsets):
        pool_services.pool_update(by=request.user, pool=pool, form=form, formsets=formsets)
        messages.success(request, f"Pool {pool.name} saved.")
        return redirect("federation:pool_edit", pk=pool.pk)
    windows, bands, exceptions = formsets
    return render(
        request,
        "federation/pool_edit.html",
        _context(
            pool,
            form=form,
            windows=windows,
            bands=bands,
            exceptions=exceptions,
            carbon_form=CarbonCsvForm(),
            readings=pool_selectors.carbon_readings_recent(pool=pool),
            reading_stale=pool_selectors.reading_stale(pool=pool),
        ),
    )


@login_required
@require_POST
def pool_read(request, pk: int):
    """Read the pool's capacity and health through its adapter now (the beat task does so every
    few minutes); a failed read shows as the pool's health, never as an error page."""
    pool = _pool_or_404(request, pk)
    reading = pool_services.pool_reading_refresh(pool=pool, by=request.user)
    if reading is None:
        messages.error(request, f"The pool could not be read: {pool.health_reason}")
    else:
        messages.success(request, f"Pool {pool.name} read: {pool.get_health_display().lower()}.")
    return redirect("federation:pool_edit", pk=pool.pk)


@login_required
@require_POST
def pool_carbon_upload(request, pk: int):
    """Store an uploaded carbon-intensity CSV; a bad file shows its first error, stores nothing."""
    pool = _pool_or_404(request, pk)
    form = CarbonCsvForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["file"]
        if upload.size > 5 * 1024 * 1024:
            messages.error(request, "The file is larger than 5 MiB.")
        else:
            try:
                n = pool_services.carbon_csv_import(by=request.user, pool=pool, data=upload.read())
            except carbon.CarbonError as exc:
                messages.error(request, f"The CSV was not imported: {exc}.")
            else:
                messages.success(request, f"{n} carbon-intensity readings imported.")
    else:
        messages.error(request, "Choose a CSV file to upload.")
    return redirect("federation:pool_edit", pk=pool.pk)


@login_required
def pool_queue(request, pk: int):
    """The pool's running and queued jobs, in the scheduler's order, each with why it waits."""
    pool = _pool_or_404(request, pk)
    return render(
        request,
        "federation/pool_queue.html",
        _context(pool, **pool_selectors.pool_queue(pool=pool)),
    )


@login_required
def pool_calendar(request, pk: int):
    """The pool's coming days: availability, price, carbon intensity and planned jobs."""
    pool = _pool_or_404(request, pk)
    return render(request, "federation/pool_calendar.html", _context(pool))


@login_required
def pool_calendar_json(request, pk: int):
    """Hourly series and planned jobs of the calendar plot (``pool_selectors.pool_calendar``)."""
    pool = _pool_or_404(request, pk)
    return JsonResponse(pool_selectors.pool_calendar(pool=pool))
