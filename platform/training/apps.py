from django.apps import AppConfig


class TrainingAppConfig(AppConfig):
    name = "training"
    verbose_name = "Jobs and turns"
