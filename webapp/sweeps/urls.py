from django.urls import path

from webapp.sweeps import views

app_name = "sweeps"
urlpatterns = [
    path("sweeps/", views.sweep_list, name="list"),
    path("sweeps/new/", views.sweep_create, name="create"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="detail"),
    path("sweeps/<int:pk>/cancel/", views.sweep_cancel, name="cancel"),
]
