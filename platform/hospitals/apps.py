from django.apps import AppConfig


class HospitalsConfig(AppConfig):
    name = "hospitals"
    verbose_name = "Hospitals"
