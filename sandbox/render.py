"""Render world records as the provider's JSON objects (plain dicts for orjson).

Field names, nesting and nullability follow the spec's tables: Tweet, User, Trend,
Space detail, User about and Community info.  A few members the platform also sends
(media `type`, a Space `title`) are included where the spec's prose mentions them.
"""

from __future__ import annotations

import base64
import time
from urllib.parse import quote_plus

from .basis import N_ACTIVE, N_BIG, b62, h64
from .phrases import TOPICS
from .world import World

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_IMAGE_SIZES = ((1200, 675), (1080, 1080), (1536, 2048), (4032, 3024), (1920, 1080), (900, 1200))
_PHOTO_FEATURES = {size: {"faces": []} for size in ("large", "medium", "small", "orig")}
SOURCES = ("Twitter for iPhone", "Twitter for Android", "Twitter Web App", "Twitter for iPad", "TweetDeck Web App")


def source(w: World, i: int) -> str:
    """The app tweet i was sent from (search's source: reads it too)."""
    return SOURCES[h64(w.seed, 34, i) % len(SOURCES)]


def created_at(seconds: int) -> str:
    """`Www Mmm dd HH:MM:SS +0000 yyyy`, independent of the process locale."""
    tm = time.gmtime(seconds)
    return (
        f"{_DAYS[tm.tm_wday]} {_MONTHS[tm.tm_mon - 1]} {tm.tm_mday:02d} "
        f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000 {tm.tm_year}"
    )


def _gql_id(kind: str, rest_id: str) -> str:
    return base64.b64encode(f"{kind}:{rest_id}".encode()).decode()


def _display(url: str) -> str:
    bare = url.split("://", 1)[-1]
    return bare if len(bare) <= 26 else bare[:25] + "…"


def _url_entity(tco: str, expanded: str, start: int, end: int) -> dict:
    return {"display_url": _display(expanded), "expanded_url": expanded, "indices": [start, end], "url": tco}


# ---- users -----------------------------------------------------------------


def avatar(w: World, u: int) -> str:
    return f"https://pbs.twimg.com/profile_images/{w.profile(u).pic}/{b62(h64(w.seed, 20, u), 8)}_normal.jpg"


def _banner(w: World, u: int) -> str | None:
    p = w.profile(u)
    return f"https://pbs.twimg.com/profile_banners/{w.user_id(u)}/{p.created_s + 86400}" if p.has_cover else None


def _pinned(w: World, u: int) -> list[str]:
    own = w.by_author[u] if u < N_ACTIVE else ()
    if not own or h64(w.seed, 21, u) % 3:
        return []
    return [w.tweets[own[h64(w.seed, 22, u) % len(own)]].id]


def _site_entity(w: World, u: int) -> dict | None:
    site = w.profile(u).site
    if site is None:
        return None
    return _url_entity(f"https://t.co/{b62(h64(w.seed, 23, u), 10)}", f"https://{site}", 0, 23)


def _automated_by(w: World, u: int) -> str | None:
    """About one ordinary account in 60 is a labelled bot, run by another account."""
    h = h64(w.seed, 28, u)
    return w.handle(N_BIG + (h >> 8) % (N_ACTIVE - N_BIG)) if u >= N_BIG and h % 60 == 0 else None


def user(w: World, u: int) -> dict:
    """The User object, with every field the provider documents, in its order (statusesCount
    included, wherever a user appears)."""
    p = w.profile(u)
    handle, name = w.identity(u)
    site = _site_entity(w, u)
    bio = None
    if p.description:
        bio = {"description": p.description, "entities": {"description": {}, "url": {"urls": [site] if site else []}}}
    bot = _automated_by(w, u)
    return {
        "type": "user",
        "userName": handle,
        "url": f"https://x.com/{handle}",
        "id": w.user_id(u),
        "name": name,
        "isBlueVerified": w.is_blue(u),
        "verifiedType": "Business" if u < N_BIG else None,
        "profilePicture": avatar(w, u),
        "coverPicture": _banner(w, u),
        "description": p.description,
        "location": p.location,
        "followers": len(w.followers(u)),
        "following": len(w.following(u)),
        "canDm": p.can_dm,
        "createdAt": created_at(p.created_s),
        "favouritesCount": p.favourites,
        "hasCustomTimelines": p.listed > 3,
        "isTranslator": False,
        "mediaCount": p.media,
        "statusesCount": w.statuses_count(u),
        "withheldInCountries": [],
        "affiliatesHighlightedLabel": {},
        "possiblySensitive": False,
        "pinnedTweetIds": _pinned(w, u),
        "isAutomated": bot is not None,
        "automatedBy": bot,
        "unavailable": False,
        "message": "",
        "unavailableReason": "",
        "profile_bio": bio,
    }


def _verification(w: World, u: int) -> dict:
    return {
        "is_blue_verified": w.is_blue(u),
        "is_verified_organization": u < N_BIG,
        "is_verified_organization_affiliate": False,
        "verified": False,
    }


def gql_user(w: World, u: int) -> dict:
    """The GraphQL user-profile object found inside Space details."""
    p = w.profile(u)
    uid, handle, name = w.user_id(u), w.handle(u), w.name(u)
    followers, following = len(w.followers(u)), len(w.following(u))
    pinned = _pinned(w, u)
    return {
        "__typename": "User",
        "id": _gql_id("User", uid),
        "rest_id": uid,
        "avatar": {"image_url": avatar(w, u)},
        "banner": {"image_url": _banner(w, u)},
        "core": {"created_at_ms": p.created_s * 1000, "name": name, "screen_name": handle},
        "dm_permissions": {"can_dm": p.can_dm},
        "has_graduated_access": True,
        "is_blue_verified": w.is_blue(u),
        "is_profile_translatable": False,
        "legacy": {
            "default_profile": not p.has_cover,
            "default_profile_image": False,
            "description": p.description,
            "entities": {"description": {"urls": []}},
            "fast_followers_count": 0,
            "favourites_count": p.favourites,
            "followers_count": followers,
            "friends_count": following,
            "has_custom_timelines": p.listed > 3,
            "is_translator": False,
            "listed_count": p.listed,
            "location": p.location or "",
            "media_count": p.media,
            "normal_followers_count": followers,
            "pinned_tweet_ids_str": pinned,
            "possibly_sensitive": False,
            "statuses_count": w.statuses_count(u),
            "translator_type": "none",
            "want_retweets": False,
            "withheld_in_countries": [],
        },
        "media_permissions": {"can_media_tag": True},
        "notifications_settings": {"notifications": False},
        "parody_commentary_fan_label": "None",
        "pinned_items": {"tweet_ids_str": pinned},
        "privacy": {"protected": False, "suspended": False},
        "profile_bio": {"description": p.description},
        "profile_image_shape": "Square" if u < N_BIG else "Circle",
        "relationship_counts": {"followers": followers, "following": following},
        "relationship_perspectives": {"following": False, "followed_by": False, "blocking": False, "muting": False},
        "super_follow_eligible": False,
        "verification": _verification(w, u),
    }


def user_about(w: World, u: int) -> dict:
    """data.data.user_result_by_screen_name of user_about."""
    p = w.profile(u)
    uid, handle = w.user_id(u), w.handle(u)
    org = u % N_BIG if u >= N_BIG else u  # every account shows one affiliation badge
    org_handle = w.handle(org)
    return {
        "rest_id": uid,
        "result": {
            "__typename": "User",
            "id": _gql_id("User", uid),
            "about_profile": {
                "account_based_in": p.country,
                "affiliate_url": f"https://x.com/{org_handle}",
                "affiliate_username": org_handle,
                "created_country_accurate": h64(w.seed, 24, u) % 4 != 0,
                "learn_more_url": "https://help.x.com/managing-your-account/about-x-verified-accounts",
                "location_accurate": h64(w.seed, 25, u) % 5 != 0,
                "report_problem_url": "https://help.x.com/forms/account-access/about-this-account",
                "source": ("Web", "Android App", "iOS App", "X")[h64(w.seed, 26, u) % 4],
                "username_changes": {"count": str(p.username_changes)},
                "verified_since_msec": str((p.created_s + 400 * 86400) * 1000),
            },
            "affiliates_highlighted_label": {
                "label": {
                    "badge": {"url": avatar(w, org)},
                    "description": w.name(org),
                    "url": {"url": f"https://x.com/{org_handle}", "url_type": "DeepLink"},
                    "user_label_display_type": "Badge",
                    "user_label_type": "BusinessLabel",
                }
            },
            "avatar": {"image_url": avatar(w, u)},
            "core": {"created_at_ms": p.created_s * 1000, "name": w.name(u), "screen_name": handle},
            "is_blue_verified": w.is_blue(u),
            "privacy": {"protected": False, "suspended": False},
            "profile_image_shape": "Square" if u < N_BIG else "Circle",
            "verification": _verification(w, u),
            "verification_info": {
                "is_identity_verified": w.is_blue(u) and h64(w.seed, 27, u) % 2 == 0,
                "reason": {"description": {"entities": [], "text": "This account is verified."}}
                if w.is_blue(u)
                else {},
            },
        },
    }


# ---- tweets ------------------------------------------------------------------


def _media(w: World, i: int, handle: str, start: int, end: int, tco: str) -> list[dict]:
    t = w.tweet(i)
    out = []
    for k in range(t.photos):
        mid = str(int(t.id) - (k + 1) * (1 << 22) * 997)  # minted just before the tweet
        h = h64(w.seed, 30, i, k)
        width, height = _IMAGE_SIZES[h % len(_IMAGE_SIZES)]
        image = f"https://pbs.twimg.com/media/{b62(h * 0x9E3779B97F4A7C15, 15)}.jpg"
        shares = [1 + (h >> (16 + 6 * n)) % 60 for n in range(3 + (h >> 12) % 3)]
        total = sum(shares)
        palette = [
            {
                "percentage": round(100 * s / total, 2),
                "rgb": {
                    "red": (h >> (3 * n)) % 256,
                    "green": (h >> (5 * n + 7)) % 256,
                    "blue": (h >> (7 * n + 11)) % 256,
                },
            }
            for n, s in enumerate(shares)
        ]
        out.append(
            {
                "display_url": f"pic.x.com/{tco.rsplit('/', 1)[-1]}",
                "expanded_url": f"https://x.com/{handle}/status/{t.id}/photo/{k + 1}",
                "features": _PHOTO_FEATURES,
                "id_str": mid,
                "indices": [start, end],
                "media_key": f"3_{mid}",
                "media_url_https": image,
                "type": "photo",
                "url": tco,
                "media_results": {
                    "id": _gql_id("ApiMediaResults", mid),
                    "result": {
                        "__typename": "ApiMedia",
                        "id": _gql_id("ApiMedia", mid),
                        "media_availability_v2": {"status": "Available"},
                        "media_id": mid,
                        "media_info": {
                            "__typename": "ApiImage",
                            "alt_text": f"Photo: {TOPICS[t.topic][1]}" if h % 3 == 0 else None,
                            "color_info": {"palette": palette},
                            "original_img_height": height,
                            "original_img_url": image,
                            "original_img_width": width,
                        },
                    },
                },
            }
        )
    return out


def entities(w: World, i: int) -> dict:
    """Tweet i's entities, in the platform's v1.1 form (both dialects show them: sandbox.dialects)."""
    c = w.content(i)
    return {
        "hashtags": [{"indices": [s, e], "text": tag} for tag, s, e in c.tags],
        "symbols": [],
        "urls": [_url_entity(c.link[2], c.link[3], c.link[0], c.link[1])] if c.link else [],
        "user_mentions": [
            {"id_str": w.user_id(u), "indices": [s, e], "name": w.name(u), "screen_name": w.handle(u)}
            for u, s, e in c.mentions
        ],
        "media": _media(w, i, w.handle(w.tweet(i).author), *c.media) if c.media else [],
    }


def tweet(w: World, i: int, nested: bool = False) -> dict:
    """The Tweet object; a quote carries its quoted tweet one level deep, as on the platform."""
    t = w.tweet(i)
    c = w.content(i)
    handle = w.handle(t.author)
    parent = w.tweet(t.parent) if t.parent >= 0 else None
    return {
        "type": "tweet",
        "id": t.id,
        "url": f"https://x.com/{handle}/status/{t.id}",
        "text": c.text,
        "source": source(w, i),
        "retweetCount": t.retweets,
        "replyCount": w.reply_count(i),
        "likeCount": t.likes,
        "quoteCount": w.quote_count(i),
        "viewCount": None if t.views is None else str(t.views),
        "createdAt": created_at(t.ms // 1000),
        "lang": t.lang,
        "bookmarkCount": t.bookmarks,
        "isReply": parent is not None,
        "inReplyToId": parent.id if parent else None,
        "conversationId": w.tweet(t.root).id,
        "displayTextRange": list(c.display),
        "inReplyToUserId": w.user_id(parent.author) if parent else None,
        "inReplyToUsername": w.handle(parent.author) if parent else None,
        "author": user(w, t.author),
        "entities": entities(w, i),
        "quoted_tweet": tweet(w, t.quote, nested=True) if t.quote >= 0 and not nested else None,
        # The world holds no reposts: a repost's original would be here, one level deep like a quote.
        "retweeted_tweet": None,
        "isLimitedReply": False,
    }


# ---- trends, spaces, communities ----------------------------------------------


def trend(name: str, volume: int | None) -> dict:
    q = quote_plus(name if name.startswith("#") else f'"{name}"')
    return {"name": name, "url": f"https://x.com/search?q={q}", "query": q, "tweet_volume": volume}


def trends(w: World, woeid: int, count: int) -> list[dict]:
    return [trend(name, volume) for name, volume in w.trends(woeid)[:count]]


def _participant(w: World, u: int, muted: bool) -> dict:
    uid = w.user_id(u)
    return {
        "avatar_url": avatar(w, u),
        "display_name": w.name(u),
        "is_muted_by_admin": False,
        "is_muted_by_guest": muted,
        "is_verified": w.is_blue(u),
        "social_screen_name": w.handle(u),
        "user_id": uid,
        "user_results": {"rest_id": uid, "result": gql_user(w, u)},
    }


def space_detail(w: World, s: int) -> dict:
    """data.data.audio_space_by_rest_id of spaces/detail."""
    sp = w.spaces[s]
    creator = w.user_id(sp.creator)
    participants = {
        "admins": [_participant(w, u, False) for u in sp.admins],
        "speakers": [_participant(w, u, h64(w.seed, 31, s, u) % 3 == 0) for u in sp.speakers],
        "listeners": [_participant(w, u, True) for u in sp.listeners],
        "total": len(sp.admins) + len(sp.speakers) + sp.live_listeners,
        "poll_interval_sec": 5,
    }
    return {
        "is_subscribed": False,
        "metadata": {
            "rest_id": sp.id,
            "state": "Running",
            "title": sp.title,
            "media_key": f"28_{h64(w.seed, 33, s) % 10**19}",
            "created_at": sp.start_ms - 60_000,
            "start": sp.start_ms,
            "conversation_controls": 0,
            "creator_results": {"rest_id": creator, "result": gql_user(w, sp.creator)},
            "creator_user_id": creator,
            "disallow_join": False,
            "is_muted": False,
            "no_incognito": False,
            "is_space_available_for_clipping": True,
            "is_space_available_for_replay": sp.replay_watched > 0,
            "max_admin_capacity": 3,
            "narrow_cast_space_type": 0,
            "participants": participants,
            "primary_admin_user_id": creator,
            "total_live_listeners": sp.live_listeners,
            "total_participated": participants["total"] + sp.replay_watched // 4,
            "total_replay_watched": sp.replay_watched,
            "tweet_results": {"rest_id": w.tweets[sp.tweet].id},
        },
    }


def _banner_media(w: World, c: int, kind: int, salient: bool) -> dict:
    h = h64(w.seed, 32, c, kind)
    mid = str(1_700_000_000_000_000_000 + h % 10**17)
    width, height = (1500, 500) if salient else (1200, 480)
    url = f"https://pbs.twimg.com/community_banner_img/{mid}/{b62(h, 8)}?format=jpg&name=orig"
    info = {
        "__typename": "ApiImage",
        "original_img_height": height,
        "original_img_url": url,
        "original_img_width": width,
    }
    if salient:
        info["salient_rect"] = {"height": 500, "left": (h >> 8) % 300, "top": 0, "width": 1200}
    return {
        "result": {
            "__typename": "ApiMedia",
            "id": _gql_id("ApiMedia", mid),
            "media_key": f"3_{mid}",
            "media_id": mid,
            "media_info": info,
        }
    }


def community_info(w: World, c: int) -> dict:
    """data.data.community_results_by_rest_id of community/info."""
    com = w.communities[c]
    return {
        "rest_id": com.id,
        "result": {
            "__typename": "Community",
            "id": _gql_id("Community", com.id),
            "rest_id": com.id,
            "name": com.name,
            "description": com.description,
            "created_at": com.created_ms,
            "creator_results": {"result": {"__typename": "User", "rest_id": w.user_id(com.creator)}},
            "custom_banner_media_results": _banner_media(w, c, 0, True),
            "default_banner_media_results": _banner_media(w, c, 1, False),
            "actions": {
                "join_action_result": {
                    "__typename": "CommunityJoinActionUnavailable",
                    "message": "You need to request to join this Community.",
                    "reason": "ViewerRequestRequired",
                },
                "leave_action_result": {
                    "__typename": "CommunityLeaveActionUnavailable",
                    "message": "You are not a member of this Community.",
                    "reason": "ViewerNotMember",
                },
            },
            "is_pinned": False,
            "join_policy": "RestrictedJoinRequestsRequireModeratorApproval",
            "member_count": com.member_count,
            "moderator_count": com.moderator_count,
            "role": "NonMember",
            "rules": [{"name": name, "rest_id": rid} for name, rid in com.rules],
        },
    }
