from django.contrib import admin

from webapp.teams.models import Invitation, Membership, Project, ShareLink, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "created_at")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline, ProjectInline]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "created_at")
    list_filter = ("team",)
    search_fields = ("name", "team__name")


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):
    list_display = ("run", "created_by", "created_at", "revoked_at")
    raw_id_fields = ("run",)
    readonly_fields = ("token",)


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ("team", "role", "invitee", "created_by", "created_at", "expires_at", "used_by", "used_at", "revoked_at")
    list_filter = ("role",)
    readonly_fields = ("token_hash", "used_at", "used_by")
