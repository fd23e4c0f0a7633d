"""Monitoring of a serving box: the dashboard's panels (built with Grafana's foundation SDK), the
Prometheus and Alertmanager HTTP APIs, and where their pages are (docs/monitoring.md)."""
