"""Site-side data sandbox: encrypted datasets, ingest, access grants. Site-side modules import no Django."""
