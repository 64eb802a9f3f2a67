from django.urls import path

from webapp.fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.workers_page, name="workers"),
    path("<str:name>/drain/", views.drain_worker, name="drain"),
    path("<str:name>/resume/", views.resume_worker, name="resume"),
]
