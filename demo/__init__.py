"""The demo federation, above all four apps (it may import every one): seeding three hospitals
(``demo_seed``) and running a job through the web form (``demo_job``), as ``run.sh`` does."""
