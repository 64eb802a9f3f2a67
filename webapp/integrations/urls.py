from django.urls import path

from webapp.integrations import views

app_name = "integrations"
urlpatterns = [
    path("projects/<int:pk>/integrations/", views.project_integrations, name="project"),
    path("projects/<int:pk>/integrations/tracking/", views.save_tracking, name="save_tracking"),
    path("projects/<int:pk>/integrations/alerts/", views.add_project_rule, name="add_project_rule"),
    path("projects/<int:pk>/integrations/monitors/", views.save_monitor_rule, name="save_monitor_rule"),
    path("monitor-rules/<int:pk>/delete/", views.delete_monitor_rule, name="delete_monitor_rule"),
    path("alerts/", views.my_alerts, name="mine"),
    path("alerts/<int:pk>/delete/", views.delete_rule, name="delete_rule"),
]
