"""Django's admin app with the coordinator's own site (:mod:`coordinator.admin_site`)."""

from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    default_site = "coordinator.admin_site.AdminSite"
